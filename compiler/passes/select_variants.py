"""Pass `select_variants`: give every conv2d and constant-weight matmul a
kernel variant (compiler/kernels) and rewrite it into a call of that
variant's execute kernel on the variant's transformed weights.

The transformed weights are computed here by running the variant's own
compiled TIR transform, so a bundle that carries them cached holds exactly
what the transform kernel would produce at run time. Each rewritten call is
an *anchor*: FuseOps later fuses its elementwise epilogue into it and
schedule_kernels applies the variant's schedule to the fused function.

Choice: {"*": variant-or-"auto", "c3": variant, "conv2d": variant, ...}
keys are anchor ids (c<k> for convs, d<k> for dense layers, in graph order),
op names, or "*". A global choice that does not apply to a layer falls back
to "auto" for it; a per-anchor one that does not apply is an error.
"""
import dataclasses
import json
import re
from dataclasses import dataclass, field

import numpy as np

from ..ir.anchors import ANCHOR_RE, forced
from ..errors import CompileError
from ..ir.narrow import direct_layers
from ..ir import dims, relayout
from ..kernels.contract import simplified
from ..kernels.generic import multiple
from ..kernels.schedule import intensity, padding_efficiency
from ..ir.relax import LayerIds, const_value, extents_of
from ..ir.branches import OPAQUE
from ..kernels import ConvSpec, DenseSpec, RecurrentSpec, applicable, get
from ..kernels.recurrent import CELL_ATTR
from ..kernels import build as kbuild
from ..kernels.conv import channel_vectors
from ..kernels.conv_blocked import PAIR_BOUND
from ..kernels.dense import int8_dot_factors
from ..ir.grid import grid_scale
from ..ir.narrow import fits_fp16, model_scale, narrow_weights, weight_error

NAME = "select_variants"


@dataclass
class Anchor:
    id: str
    index: int
    spec: object
    variant: object
    params: dict
    raw: np.ndarray
    transformed: np.ndarray = None
    const: object = None
    transform_func: object = None
    relayout: object = None  # the transform only rearranges: its Relayout (compiler/ir/relayout.py)
    alternatives: list = field(default_factory=list)
    tuned: bool = False  # params measured on this machine (compiler/measure/tune.py)
    direct: str = ""  # "fp16" / "int8": transformed weights stored so, read in place by the execute kernel
    scale: object = None  # int8 direct: the relax constant of the per-output-channel scales
    direct_error: float = 0.0  # direct: max |w' - w| / max |w| of the narrow weights stored
    exact: object = None  # sized at run time: the spec with its extents symbolic (`spec` holds the typical sizes;
                          # the kernel is built from the rewritten call's own, whose variables are its input's)


def auto_variant(spec, isa):
    """The default variant of a layer for the vector unit `isa`, when neither
    the caller nor a cost-table plan chose one."""
    if isinstance(spec, DenseSpec):
        return next((v for v in ("dense.int8_tiles", "dense.int8_dot", "dense.int8_dot_k", "dense.pair_dot")
                     if get(v, isa).applies(spec)),
                    "dense.packed_gemm")
    if isinstance(spec, RecurrentSpec):
        return next((v for v in ("recurrent.int8_dot", "recurrent.pair_dot") if get(v, isa).applies(spec)),
                    "recurrent.packed")
    if spec.out_block:  # blocked activations (compiler/passes/block_layout.py)
        if get("conv2d.pair_blocked", isa).applies(spec):  # a quantized layer's integers
            return "conv2d.pair_blocked"
        return "conv2d.depthwise_blocked" if spec.depthwise else "conv2d.blocked"
    if spec.depthwise:
        return "conv2d.depthwise_direct"
    # narrow outputs (under two vectors wide) waste width-vector lanes: put
    # output channels in the lanes, unless that pads the channels much
    lanes = isa.lanes
    narrow = spec.out_w <= max(28, 2 * lanes) and spec.out_w % lanes != 0
    kvec = "_kvec" if narrow and channel_vectors(spec, lanes) * lanes <= 1.15 * spec.k else ""
    if spec.groups == 1 and spec.r == 1 and spec.s == 1 and spec.stride == (1, 1) and not any(spec.pad):
        return "conv2d.gemm_1x1" + kvec
    if spec.groups == 1:
        return "conv2d.im2col_gemm" + kvec
    return "conv2d.direct"


def _choose(anchor_id, op, spec, choice, isa, tuning):
    """(variant, params, tuned) for one anchor. A choice value is a variant
    name or (variant name, schedule params). Without given params, a variant
    gets the ones `tuning` (compiler/measure/tune.py) measured for this layer shape,
    else the first of its space (the target's register/cache model)."""
    names = [v.name for v in applicable(spec, op, isa)]
    for key, want, full, params in forced(choice, anchor_id, op):
        if full in names:
            v = get(full, isa)
            if params is not None:
                return v, params, False
            return (v, *_params(v, spec, tuning))
        if key == anchor_id:
            raise CompileError(f"variant '{want}' does not apply to {anchor_id} ({spec}); applicable: {names}")
    best = tuning.best(spec) if tuning else None
    v = get(best or auto_variant(spec, isa), isa)
    return (v, *_params(v, spec, tuning))


def _params(variant, spec, tuning):
    measured = tuning.params(spec, variant.name) if tuning else None
    return (measured, True) if measured is not None else (variant.space(spec)[0], False)


def _anchor(anchor_id, index, op_name, spec, exact, w, chooser):
    """The Anchor of a layer, its variant and parameters chosen (`chooser`:
    _choose's choice, isa, tuning); sized at run time, the default variant
    where the chosen one computes fixed sizes only, None where that one does
    too (the generic schedule)."""
    choice, isa, tuning = chooser
    v, params, tuned = _choose(anchor_id, op_name, spec, choice, isa, tuning)
    if exact is not None and not v.symbolic:  # a plan's choice for fixed sizes only: the default, if it computes it
        v, params, tuned = _choose(anchor_id, op_name, spec, {}, isa, None)
        if not v.symbolic:
            return None
    return Anchor(anchor_id, index, spec, v, _whole_tiles(v, spec, exact, params),
                  np.ascontiguousarray(w.astype(spec.dtype)), alternatives=[a.name for a in applicable(spec, op_name, isa)],
                  tuned=tuned, exact=exact)


def _whole_tiles(variant, spec, exact, params):
    """A layer sized at run time: `params`, or the register block of most
    FMAs per load (of the variant's own) whose row tile (zt) divides the
    output row at every size where it does more than the chosen tile over
    the row padded to whole tiles (both times their channels' useful share,
    the chosen one's also times the row's at the typical size)."""
    if exact is None or "kvb" not in params or multiple(exact.out_w, params["zt"]):
        return params
    kblocks = spec.k // variant.isa.lanes
    blocks = variant.register_blocks(spec, [z for z in range(1, 15) if multiple(exact.out_w, z)])
    best, zt, kvb = max((intensity(z, v) * padding_efficiency((kblocks, v)), z, v) for z, v in blocks)
    chosen = params["zt"], params["kvb"]
    if best < intensity(*chosen) * padding_efficiency((spec.out_w, chosen[0]), (kblocks, chosen[1])):
        return params
    return {**params, "zt": zt, "kvb": kvb}


def _block(layout):
    """0 for NCHW, b for the blocked NCHW{b}c (compiler/passes/block_layout.py), None otherwise."""
    m = re.fullmatch(r"NCHW(?:(\d+)c)?", str(layout))
    return None if m is None else int(m.group(1) or 0)


def _spec_of(call, op_name, w, variables=None):
    """(spec, exact): the ConvSpec or DenseSpec of a layer with constant
    weights `w` at its input's size, or (None, None) where no variant
    takes it. Sized at run time (`variables`: {Dim: var}), `spec` is at the
    typical sizes (what the variant and its parameters are chosen for) and
    `exact` has the symbolic extents the kernel is built with; else exact
    is None."""
    x_ty = call.args[0].ty
    if getattr(x_ty, "shape", None) is None:  # its shape unknown: extract_layers names it
        return None, None
    extents = list(x_ty.shape.values)
    static = dims.is_static(extents)
    xs = [int(d) for d in extents] if static else list(dims.typical(extents, variables))
    dtype = str(x_ty.dtype)
    if op_name == "conv2d":
        a = call.attrs
        ib, ob = _block(a.data_layout), _block(a.out_layout)
        if (ib is None or ob is None or (ib and not ob) or str(a.kernel_layout) != "OIHW" or len(xs) != (5 if ib else 4)
                or (a.out_dtype is not None and str(a.out_dtype) not in ("", "void", dtype)) or dtype != "float32"):
            return None, None
        spec = ConvSpec.of_conv2d(a, xs, w.shape, dtype, ib, ob)
        if static:
            return spec, None
        if not dims.is_static(extents[1:2]):  # channels sized at run time: the generic schedule
            return None, None
        return spec, dataclasses.replace(spec, n=extents[0], h=extents[2], w=extents[3])
    # rows: x [M, K], a batch-1 sequence [1, ..., 1, M, K], or a batch of them (the rows taken flat)
    if w.ndim != 2 or len(xs) < 2 or dtype != "float32" or str(w.dtype) != dtype:
        return None, None
    if not static and len(xs) > 2 and dims.is_static(extents[1:]) and dims.is_plain(extents[0]):
        # a batch sized at run time of fixed rows (a batch of sequences): the rows flat, the batch outermost
        spec = DenseSpec(int(np.prod(xs[:-1])), xs[-1], int(w.shape[1]), dtype, batch=tuple(xs[:-1]))
        rows = [int(d) for d in extents[1:-1]]
        return spec, dataclasses.replace(spec, m=simplified(extents[0] * int(np.prod(rows))),
                                         batch=(extents[0], *rows))
    if any(d != 1 for d in xs[:-2]):
        if not static:
            return None, None
        return DenseSpec(int(np.prod(xs[:-1])), xs[-1], int(w.shape[1]), dtype, batch=tuple(xs[:-1])), None
    spec = DenseSpec(xs[-2], xs[-1], int(w.shape[1]), dtype, len(xs) - 2)
    if static:
        return spec, None
    if not dims.is_static(extents[:-2] + extents[-1:]):
        return None, None
    return spec, dataclasses.replace(spec, m=extents[-2])


def _for_integers(spec, x, w, binding, own_scales):
    """`spec` with what its input and weights allow the integer variants:
    a dense layer's input grid (_on_grid), a convolution's (_on_conv_grid),
    a quantized cell's int8 weights."""
    if isinstance(spec, DenseSpec):
        return _on_grid(spec, x, w, binding, own_scales)
    if isinstance(spec, ConvSpec):
        return _on_conv_grid(spec, x, w, binding, own_scales)
    if isinstance(spec, RecurrentSpec) and spec.quantize_h:
        return dataclasses.replace(spec, int8_weights=_int8_cell(w))
    return spec


def _on_the_same_grid(exact, spec):
    """A dense layer's spec sized at run time (the kernel's) with the input
    grid _on_grid found for its typical spec."""
    if exact is None or not isinstance(spec, DenseSpec):
        return exact
    return dataclasses.replace(exact, in_scale=spec.in_scale, in_shift=spec.in_shift)


def _on_grid(spec, x, w, binding, own_scales):
    """`spec` with its input's quantized grid (DenseSpec.in_scale) where x
    holds 8-bit integers, times a scale: a DequantizeLinear's output (a
    per-tensor constant scale and zero point), or a cast of them to float
    (an integer product's left operand: MatMulInteger, decompose.py),
    and w is the model's own int8 weights: the integer variant
    (dense.int8_dot) can then multiply the integers."""
    call = _eight_bit_source(x, binding)
    if call is None or model_scale(w, 1, own_scales) is None:
        return spec
    kind = str(call.args[0].ty.dtype)
    if call.op.name == "relax.astype":
        scale, zero = np.ones(1), np.zeros(1)
    else:
        scale, zero = (const_value(a, binding) for a in call.args[1:3])
    if scale is None or zero is None or scale.size != 1 or zero.size != 1:
        return spec
    scale, zero = float(scale.reshape(())), int(zero.reshape(()))
    shift = zero + (128 if kind == "int8" else 0)  # q - zero + shift in [0, 255]
    if not scale > 0 or not 0 <= shift <= 255:
        return spec
    return dataclasses.replace(spec, in_scale=scale, in_shift=shift)


def _on_conv_grid(spec, x, w, binding, own_scales):
    """`spec` with its input's integer grid (ConvSpec.in_scale) where x is
    integers within +-PAIR_BOUND times a scale (compiler/ir/grid.py: a
    ConvInteger's input less its zero point, a DequantizeLinear's output)
    and w the model's integers within the same bound times a scale per
    output channel: conv2d.pair_blocked can then multiply the integers."""
    if model_scale(w, 0, own_scales, PAIR_BOUND) is None:
        return spec
    scale = grid_scale(x, binding, PAIR_BOUND)
    return spec if scale is None else dataclasses.replace(spec, in_scale=scale)


def _eight_bit_source(x, binding):
    """The cast or DequantizeLinear (relax.astype / relax.dequantize) of
    8-bit integers that computes `x`, or None."""
    import tvm
    from tvm import relax

    call = binding(x) if isinstance(x, relax.Var) else None
    if (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
            and call.op.name in ("relax.astype", "relax.dequantize") and str(call.args[0].ty.dtype) in ("int8", "uint8")):
        return call
    return None


def _integers(x, binding, a):
    """The 8-bit integers under an integer dense variant's input (the cast
    or DequantizeLinear _on_grid found): the kernel reads them, not the
    floats made of them (a quarter of the bytes, no conversion pass); else
    x (an integer convolution's padding pass converts the floats)."""
    call = _eight_bit_source(x, binding) if a.variant.integer and isinstance(a.spec, DenseSpec) else None
    return x if call is None else call.args[0]


def apply(mod, isa, choice=None, tuning=None, direct=None, own_scales=(), variables=None):
    """Variants made for the vector unit `isa` (targets.Vector); `tuning`
    (compiler/measure/tune.py's result, or None) supplies measured choices.
    `direct(anchor_id)` names the precision ("fp16", "int8") of the anchors
    that get the direct weight form (compiler/passes/plan_weights.py), else None:
    their execute kernel reads the transformed weights stored narrow and
    widens them in registers (int8: the sums scaled per output channel, the
    scales an extra argument). It applies where the variant's transform
    only rearranges values and, for fp16, the weights fit fp16; elsewhere
    the layer keeps fp32 transformed weights. `own_scales`: _own_int8's and
    _on_grid's. Returns (mod, anchors)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    choice = dict(choice or {})
    ops = {"conv2d": tvm.ir.Op.get("relax.nn.conv2d"), "dense": tvm.ir.Op.get("relax.matmul")}

    @mutator
    class Rewriter(PyExprMutator):
        def __init__(self, mod, phase, anchors):
            super().__init__(mod)
            self.mod_, self.phase, self.anchors, self.ids = mod, phase, anchors, LayerIds()
            self.errors = []

        def visit_call_(self, call):
            # TVM hands an exception raised in here back as a RuntimeError
            # holding its text: keep the first CompileError to raise after
            try:
                return self.rewrite(call)
            except CompileError as e:
                self.errors.append(e)
                return call

        def rewrite(self, call):
            call = self.visit_expr_post_order(call)
            op_name = next((n for n, op in ops.items() if call.op.same_as(op)), None)
            cell = _cell_of(self.mod_, call, variables)
            if cell is not None:
                op_name, args = "recurrent", list(call.args[1].fields)
            elif op_name is None:
                return call
            else:
                args = list(call.args)
            w = const_value(args[1], self.lookup_binding)
            if w is None:
                return call
            anchor_id = self.ids.next(op_name)
            spec, exact = cell or _spec_of(call, op_name, w, variables)
            if spec is None:
                return call
            if self.phase == "collect":
                spec = _for_integers(spec, args[0], w, self.lookup_binding, own_scales)
                exact = _on_the_same_grid(exact, spec)
                a = _anchor(anchor_id, len(self.anchors), op_name, spec, exact, w, (choice, isa, tuning))
                self.anchors += [a] if a is not None else []
                return call
            a = next((a for a in self.anchors if a.id == anchor_id), None)
            if a is None:
                return call
            if cell is not None:
                return _cell_call(self.builder_, a, args, call, self.lookup_binding)
            x = _integers(call.args[0], self.lookup_binding, a)
            return self.builder_.call_te(kbuild.execute_te(a.variant, a.exact or a.spec, a.params), x, a.const,
                                         *([a.scale] if a.scale is not None else []),
                                         primfunc_name_hint=f"cb{a.index}_{a.variant.name.split('.')[1]}")

        def transform(self):
            for gv, func in self.mod_.functions.items():
                if isinstance(func, relax.Function):
                    self.builder_.update_func(gv, self.visit_expr(func))
            if self.errors:
                raise self.errors[0]
            return self.builder_.get()

    anchors = []
    Rewriter(mod, "collect", anchors).transform()
    _stored_weights(anchors, direct, _transform_weights(anchors), own_scales)
    new_mod = Rewriter(mod, "rewrite", anchors).transform()
    return _settled(new_mod), anchors


def _settled(mod):
    """Anchors fuse with their elementwise epilogue (OutEWiseFusable); cells
    stay opaque, and their placeholders (all replaced) go."""
    from tvm import relax

    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            continue
        if func.attrs is not None and CELL_ATTR in func.attrs:
            del mod[gv]
        elif ANCHOR_RE.search(gv.name_hint) and "_cell_" not in gv.name_hint:
            mod[gv] = func.with_attr("op_pattern", 4)
    return mod


def _cell_call(builder, a, args, call, binding):
    """A cell placeholder's call made on the chosen variant's kernel and
    its weights (a.const: transformed, or raw for the transform at run time);
    an integer cell's scales with its weight rows' sums (recurrent.int8_dot)."""
    from tvm import relax

    if a.variant.integer:
        h = a.spec.hidden
        sums = a.raw[:, :, :h].sum(axis=2)
        scale = relax.const(np.stack([const_value(args[4], binding), sums], axis=1).astype(np.float32))
        args = args[:4] + [scale] + args[5:]  # then the sizes (kernels/recurrent.py size_vars)
    spec = dataclasses.replace(a.spec, seq=a.exact.seq) if a.exact else a.spec  # xw's own length
    func = a.variant.kernel(spec, a.params, "int8" if a.direct else a.spec.dtype).with_attr("op_pattern", OPAQUE)
    gv = builder.add_func(func, f"cb{a.index}_cell_{a.variant.name.split('.')[1]}")
    return relax.call_tir(gv, relax.Tuple([args[0], a.const, *args[2:]]), list(call.ty.fields))


def _cell_of(mod, call, variables=None):
    """(spec, exact): the RecurrentSpec of a call of a cell's placeholder
    kernel (import_relax), else None. Its sequence sized at run time, `spec`
    is at the typical length and `exact` at xw's extent; else exact is None."""
    import tvm

    if not call.op.same_as(tvm.ir.Op.get("relax.call_tir")):
        return None
    func = mod[call.args[0]]
    if func.attrs is None or CELL_ATTR not in func.attrs:
        return None
    spec = RecurrentSpec(**json.loads(str(func.attrs[CELL_ATTR])))
    if spec.seq is not None:
        return spec, None
    seq = extents_of(call.args[1].fields[0])[0]
    return dataclasses.replace(spec, seq=dims.typical([seq], variables)[0]), dataclasses.replace(spec, seq=seq)


STREAMED_ROWS = 32  # a dense layer of at most this many rows reads each weight so often: its time is their bytes


def _int8_cell(raw):
    """A quantized cell's raw weights are int8 integers with a zero bias
    column (R's bias joined the projection's): recurrent.int8_dot's."""
    return bool(np.array_equal(np.rint(raw), raw) and np.abs(raw).max(initial=0) <= 127 and not raw[..., -1].any())


def _own_int8(a, own_scales):
    """The scale per output channel under which a layer has the model's own
    int8 weights and streams them, or None: a dense layer of few rows
    (STREAMED_ROWS; a quantized model's weights, `own_scales` as
    fold_constants and legalize_onnx record them), or a quantized cell (its
    weights are the model's integers, scaled in the kernel), which reads
    every weight once per step. Read int8 in place (exact), they move a
    quarter of the bytes."""
    axis = kbuild.output_axis(a.spec)
    if isinstance(a.spec, RecurrentSpec):
        return np.ones(a.raw.shape[axis], np.float32) if a.spec.int8_weights else None  # _int8_cell
    if a.variant.integer:  # its spec is on a grid only with the model's integer weights (_on_grid, _on_conv_grid)
        return model_scale(a.raw, axis, own_scales, PAIR_BOUND if a.variant.weight_dtype == "int16" else 127)
    if not own_scales or not isinstance(a.spec, DenseSpec) or a.spec.m > STREAMED_ROWS:
        return None
    return model_scale(a.raw, axis, own_scales)


def _stored_weights(anchors, direct, transform, own_scales=()):
    """Each anchor's weights as its kernel reads them (a.const): fp32
    transformed, or in the direct form narrow (fp16; int8 with per-channel
    scales, a.scale) where `direct(a.id)` asks for it and it applies, or
    where a streaming layer has the model's own int8 weights (_own_int8);
    an integer variant's always (int8, its [2, N] factors as a.scale)."""
    from tvm import relax

    for a in anchors:
        want = (direct and direct(a.id)) or ""
        cell = isinstance(a.spec, RecurrentSpec)
        own = (_own_int8(a, own_scales) if a.variant.integer or (not want and (a.variant.transform_rearranges or cell))
               else None)
        if own is not None and a.variant.weight_dtype == "int16":
            _int16_weights(a, own, transform)
            continue
        want = "int8" if own is not None else want
        a.direct = want if (a.variant.transform_rearranges or own is not None) and (
            want != "fp16" or fits_fp16(a.raw)) else ""
        if not a.direct:
            a.const = relax.const(a.transformed)
            continue
        stored, wide = narrow_weights(a.raw, a.direct, kbuild.output_axis(a.spec), own)
        a.direct_error = weight_error(a.raw, wide)
        if a.direct == "int8":  # the values rearranged as they are (exact integers), scaled after the sum
            a.const = relax.const(transform(a, stored[0].astype(np.float32)).astype(np.int8))
            scale = int8_dot_factors(a.spec, stored[0], stored[1]) if a.variant.integer and not cell else stored[1]
            a.scale = None if cell else relax.const(scale.reshape(kbuild.scale_shape(a.spec, a.variant)))
        else:
            a.const = relax.const(a.transformed.astype(np.float16))


def _int16_weights(a, scale, transform):
    """An integer convolution's weights (conv2d.pair_blocked): the model's
    integers (exact under `scale`, model_scale) packed as int16, and the
    factor in_scale x scale per output channel its sums are multiplied by."""
    from tvm import relax

    shape = [1] * a.raw.ndim
    shape[kbuild.output_axis(a.spec)] = -1
    q = np.rint(a.raw / scale.reshape(shape))
    a.direct, a.direct_error = "int16", 0.0
    a.const = relax.const(transform(a, q.astype(np.float32)).astype(np.int16))
    factor = (np.float64(a.spec.in_scale) * scale).astype(np.float32)
    a.scale = relax.const(factor.reshape(kbuild.scale_shape(a.spec, a.variant)))


def _transform_weights(anchors):
    """Run every anchor's transform kernel (compiled for this machine)."""
    import tvm
    from coldbrew.targets import resolve

    funcs = {}
    for a in anchors:
        f = kbuild.transform_func(a.variant, a.spec, a.params)
        a.transform_func = f
        if f is not None:
            funcs[f"cb_transform_{a.index}"] = f
    if not funcs:
        for a in anchors:
            a.transformed = a.raw
        return lambda a, raw: raw
    lib = kbuild.build(funcs, resolve("host"))
    dev = tvm.cpu()

    def transform(a, raw):
        if a.transform_func is None:
            return raw
        out = tvm.runtime.tensor(np.zeros(a.variant.transformed_shape(a.spec, a.params), a.spec.dtype), dev)
        lib[f"cb_transform_{a.index}"](tvm.runtime.tensor(np.ascontiguousarray(raw, a.spec.dtype), dev), out)
        return out.numpy()

    for a in anchors:
        a.transformed = transform(a, a.raw)
        probe = relayout.probe(a.raw.shape) if a.transform_func is not None and a.variant.transform_rearranges else None
        a.relayout = relayout.fit(transform(a, probe), a.raw.shape) if probe is not None else None
    return transform


def run(c):
    c.mod, c.anchors = apply(c.mod, c.target.vector, c.choices.variants, c.tuning, direct_layers(c.choices.weights, c.choices.precision),
                             c.qdq_scales, c.dims)
    return c
