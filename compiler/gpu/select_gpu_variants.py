"""Pass `select_gpu_variants` (GPU targets, in place of select_variants):
every convolution with its epilogue becomes one call of a shape-generic GPU
variant (compiler/gpu/conv.py).

A chain conv2d -> [+ bias] -> [+ residual] -> [relu | max(lo) | min(hi)]...,
each value used only by the next, is replaced by one opaque call (FuseOps
leaves it alone) of a TIR function computing the same thing; its weight
constant is the layer's anchor, so extract_layers names the layer and its
variant. codegen_spirv emits the variant's shader for it, with the layer's
shapes in push constants, instead of lowering that function. Everything else
keeps the dlight path (schedule_gpu).
"""
import math
from dataclasses import dataclass, field

import numpy as np

from ..ir.anchors import GPU_ANCHOR_RE
from ..errors import CompileError
from ..ir.relax import clip_half, const_value, layer_id, per_channel, shape_of
from ..kernels.contract import ConvSpec
from . import conv as gpu_conv

NAME = "select_gpu_variants"
OPAQUE = 8  # relax OpPatternKind kOpaque: never fused with its neighbours


@dataclass
class GpuAnchor:
    """What extract_layers reads from an anchor (as select_variants.Anchor)."""
    id: str
    index: int
    conv: ConvSpec
    epilogue: gpu_conv.Epilogue
    variant: object          # the gpu_conv variant (its .name is what extract_layers reads)
    const: object = None
    params: dict = field(default_factory=dict)
    tuned: bool = False
    transform_func: object = None
    end: object = None       # the chain's last Relax call
    x: object = None         # its input value
    weight: np.ndarray = None
    bias: np.ndarray = None
    res: object = None       # the residual value, or None
    ops: str = "conv2d"      # the chain, e.g. conv2d_bias_add_relu


def _vars_in(expr, out):
    from tvm import relax

    if isinstance(expr, relax.Var):
        out.append(expr)
    elif isinstance(expr, relax.Tuple):
        for f in expr.fields:
            _vars_in(f, out)
    elif isinstance(expr, relax.Call):
        for a in expr.args:
            _vars_in(a, out)
    return out


def _conv_of(call, op):
    """ConvSpec and weights of a float32 NCHW conv2d with constant weights."""
    if not call.op.same_as(op):
        return None
    a, xs, w = call.attrs, shape_of(call.args[0]), const_value(call.args[1])
    if (w is None or xs is None or len(xs) != 4 or str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW"
            or str(a.out_layout) != "NCHW" or str(call.args[0].ty.dtype) != "float32" or w.dtype != np.float32
            or (a.out_dtype is not None and str(a.out_dtype) not in ("", "void", "float32"))):
        return None
    return ConvSpec.of_conv2d(a, xs, w.shape), w


def _chains(func, choice):
    """Anchors for the conv chains of one Relax function, in graph order."""
    import tvm
    from tvm import relax

    ops = {n: tvm.ir.Op.get(f"relax.{n}") for n in ("nn.conv2d", "add", "nn.relu", "call_tir")}
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    uses = {}
    for b in bindings:
        for v in _vars_in(b.value, []):
            uses[v] = uses.get(v, 0) + 1
    for v in _vars_in(func.body.body, []):
        uses[v] = uses.get(v, 0) + 2  # an output is never folded into a chain
    user = {}
    for b in bindings:
        for v in _vars_in(b.value, []):
            user[v] = b

    def clamp_of(call):
        """(lo, hi) of relu or of a legalized ONNX Clip half (max/min by a constant)."""
        if call.op.same_as(ops["nn.relu"]):
            return 0.0, math.inf
        half = clip_half(call)
        if half is None or half[2].dtype != np.float32:
            return None
        kind, _, bound = half
        return (float(bound), math.inf) if kind == "maximum" else (-math.inf, float(bound))

    anchors, claimed = [], set()  # claimed: bindings already inside an earlier chain
    for b in bindings:
        if not isinstance(b.value, relax.Call):
            continue
        found = _conv_of(b.value, ops["nn.conv2d"])
        if found is None:
            continue
        conv, w = found
        out_shape = (conv.n, conv.k, conv.out_h, conv.out_w)
        bias, res, lo, hi = np.zeros(conv.k, np.float32), None, -math.inf, math.inf
        stage, cur, names = 0, b, ["conv2d"]  # stages: 0 conv, 1 bias, 2 residual, 3 clamps
        while uses.get(cur.var) == 1 and cur.var in user:
            nxt = user[cur.var]
            call = nxt.value
            if not isinstance(call, relax.Call) or nxt.var in claimed:
                break
            if call.op.same_as(ops["add"]) and stage < 2:
                other = call.args[1] if call.args[0].same_as(cur.var) else call.args[0]
                c = const_value(other)
                if stage == 0 and c is not None and c.dtype == np.float32 and per_channel(c, conv.k) is not None:
                    bias, stage = per_channel(c, conv.k), 1
                    names.append("bias")
                elif c is None and shape_of(other) == out_shape and str(other.ty.dtype) == "float32" and \
                        not other.same_as(cur.var):
                    res, stage = other, 2
                    names.append("add")
                else:
                    break
            else:
                bounds = clamp_of(call)
                if bounds is None:
                    break
                lo, hi, stage = max(lo, bounds[0]), min(hi, bounds[1]), 3
            cur = nxt
            claimed.add(nxt.var)
        anchor_id = layer_id("conv2d", len(anchors))
        want = choice.get(anchor_id)
        if want and want != "auto" and gpu_conv.full_name(want) not in gpu_conv.applicable(conv):
            raise CompileError(f"GPU variant {want} does not apply to {anchor_id} "
                               f"(it takes {', '.join(gpu_conv.applicable(conv))})")
        v = gpu_conv.choose(conv, want or choice.get("conv2d") or choice.get("*"))
        anchors.append(GpuAnchor(anchor_id, len(anchors), conv, gpu_conv.Epilogue(res is not None, lo, hi), v,
                                 end=cur.value, x=b.value.args[0], weight=np.ascontiguousarray(w), bias=bias, res=res,
                                 ops="_".join(names + ([] if stage < 3 else
                                                       ["relu" if (lo, hi) == (0.0, math.inf) else "clip"]))))
    return anchors


def _te(conv, ep):
    """The chain as a TE function (the layer's meaning; codegen emits the variant's shader)."""
    from tvm import te, topi

    def f(x, w, b, *res):
        pad = list(conv.pad)
        if conv.groups == 1:
            y = topi.nn.conv2d_nchw(x, w, list(conv.stride), pad, list(conv.dilation))
        else:
            y = topi.nn.group_conv2d_nchw(x, w, list(conv.stride), pad, list(conv.dilation), conv.groups)

        def epilogue(n, k, i, j):
            v = y[n, k, i, j] + b[k]
            if res:
                v = v + res[0][n, k, i, j]
            if ep.lo > -math.inf:
                v = te.max(v, np.float32(ep.lo))
            if ep.hi < math.inf:
                v = te.min(v, np.float32(ep.hi))
            return v

        return te.compute(y.shape, epilogue, name="epilogue")
    return f


def apply(mod, choice=None):
    """`choice` forces variants as select_variants' does ({"*": v, "conv2d":
    v, "c3": v}; "winograd" or "gpu.conv_winograd"); a global one that does
    not apply to a layer falls back to the default for it, a per-layer one
    is an error. Returns (mod, anchors)."""
    choice = dict(choice or {})
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    mod = relax.transform.FoldConstant()(mod)  # Clip bounds and reshaped biases become constants
    anchors = []
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            anchors += _chains(func, choice)
    for i, a in enumerate(anchors):
        a.id, a.index = layer_id("conv2d", i), i
        a.const = relax.const(a.weight)

    @mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            a = next((a for a in anchors if a.end.same_as(call)), None)
            if a is None:
                return self.visit_expr_post_order(call)
            args = [self.visit_expr(a.x), a.const, relax.const(a.bias)]
            if a.res is not None:
                args.append(self.visit_expr(a.res))
            return self.builder_.call_te(_te(a.conv, a.epilogue), *args, primfunc_name_hint=f"cbg{a.index}_{a.ops}")

        def transform(self, mod):
            for gv, func in mod.functions.items():
                if isinstance(func, relax.Function):
                    self.builder_.update_func(gv, self.visit_expr(func))
            return self.builder_.get()

    new_mod = Rewriter(mod).transform(mod)
    for gv, func in list(new_mod.functions.items()):
        if GPU_ANCHOR_RE.search(gv.name_hint) and not isinstance(func, relax.Function):
            new_mod[gv] = func.with_attr("op_pattern", OPAQUE)
    return new_mod, anchors


def run(c):
    c.mod, c.anchors = apply(c.mod, c.choices.variants)
    return c
