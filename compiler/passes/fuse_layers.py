"""Pass `fuse_layers`: lower Relax operators to TIR and fuse them into layers.

Each Relax operator becomes a TIR PrimFunc (legalization); constants are
folded; then producers are fused with their elementwise consumers (conv +
bias + activation + residual add, ...), each fused group one PrimFunc: one
coldbrew layer.
"""
from ..errors import CompileError
from ..ir.anchors import GPU_MAX_BINDINGS
from ..ir.branches import APART

NAME = "fuse_layers"


def _sigmoid_te(x):
    """1 / (1 + e^-x) with TVM's polynomial exp (topi.fast_exp): LLVM
    vectorizes it, where the exp intrinsic becomes one libm call per lane
    (efficientnet's swish epilogues ran 4x slower). Absolute error under
    1e-7 over all of fp32 (the input clamped at +-88, as fast_exp clamps)."""
    from tvm import te, tirx, topi

    e = topi.fast_exp(topi.negative(x))
    one = tirx.const(1.0, x.dtype)
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="cb_sigmoid")


def _legalize_sigmoid(bb, call):
    if str(call.args[0].ty.dtype) != "float32":
        from tvm import topi

        return bb.call_te(topi.sigmoid, call.args[0])
    return bb.call_te(_sigmoid_te, call.args[0], primfunc_name_hint="sigmoid")


def _legalize_strided_slice(bb, call):
    """A slice that reverses an axis (a flip) is a layer of its own: fused, its index `K - c` meets a
    blocked tensor's `c // 8`, which TVM's buffer flattening rewrites wrongly (it drops K's remainder)."""
    import tvm

    out = tvm.ir.Op.get("relax.strided_slice").get_attr("FLegalize")(bb, call)  # a call_tir
    if any(int(getattr(s, "value", 1)) < 0 for s in (call.args[4] if len(call.args) > 4 else ())):
        bb.update_func(out.args[0], bb.get()[out.args[0]].with_attr("op_pattern", OPAQUE).with_attr(APART, True))
    return out


def _polynomial(name):
    """Legalization of exp, softmax, erf or tanh on float32 by TVM's
    polynomial forms (topi.fast_exp, fast_softmax, fast_erf, fast_tanh),
    which LLVM vectorizes, where the intrinsics become one libm call per
    lane (a transformer's softmax ran 10x slower than onnxruntime's).
    Measured over [-20, 20]: exp within 1.3e-7 relative, erf and tanh within
    3.4e-7 absolute. Other dtypes keep TVM's exact forms."""
    from tvm import topi

    fast, exact = {"exp": (topi.fast_exp, topi.exp), "erf": (topi.fast_erf, topi.erf),
                   "tanh": (topi.fast_tanh, topi.tanh), "softmax": (topi.nn.fast_softmax, topi.nn.softmax)}[name]

    def legalize(bb, call):
        x = call.args[0]
        extra = [int(call.attrs.axis)] if name == "softmax" else []
        if name == "softmax" and _ragged_rows(x, extra[0]):
            return bb.call_te(_row_softmax_te, x, primfunc_name_hint=name)
        return bb.call_te(fast if str(x.ty.dtype) == "float32" else exact, x, *extra, primfunc_name_hint=name)

    return legalize


VECTOR_ROW = 16  # a row reduction's vectors are whole for every target's lanes (4, 8, 16)


def _ragged_rows(x, axis):
    """A float32 softmax over a last axis of several vectors and a few
    values more (6,625 classes): _row_softmax_te's."""
    shape = [d for d in x.ty.shape.values]
    if not hasattr(shape[-1], "value"):  # a row sized at run time: topi's softmax takes any row
        return False
    n = int(shape[-1])  # (the rows before it may be sized at run time: a line's characters)
    return str(x.ty.dtype) == "float32" and axis in (-1, len(shape) - 1) and n >= 2 * VECTOR_ROW and n % VECTOR_ROW


def _row_softmax_te(x, log=False):
    """Softmax (or log-softmax) over the last axis whose row is q whole
    vectors and r < 16 values more: each row's max and sum reduce the
    whole vectors (the generic schedule's per-lane row reduction) and the
    r values apart, then combine the two; exp as topi.fast_exp."""
    from tvm import te, tirx, topi

    lead, n = list(x.shape[:-1]), int(x.shape[-1])
    q = n // VECTOR_ROW * VECTOR_ROW

    def reduced(value, combine, name):
        k, t = te.reduce_axis((0, q), "k"), te.reduce_axis((q, n), "t")
        body = te.compute(lead, lambda *i: combine(value(i, k), axis=k), name=f"cb_{name}_vectors")
        tail = te.compute(lead, lambda *i: combine(value(i, t), axis=t), name=f"cb_{name}_rest")
        return body, tail

    mb, mt = reduced(lambda i, k: x[i + (k,)], te.max, "max")
    m = te.compute(lead, lambda *i: tirx.max(mb[i], mt[i]), name="cb_max")
    e = topi.fast_exp(te.compute(x.shape, lambda *i: x[i] - m[i[:-1]], name="cb_shifted"))
    sb, st = reduced(lambda i, k: e[i + (k,)], te.sum, "sum")
    if log:
        return te.compute(x.shape, lambda *i: x[i] - m[i[:-1]] - tirx.log(sb[i[:-1]] + st[i[:-1]]),
                          name="cb_log_softmax")
    return te.compute(x.shape, lambda *i: e[i] / (sb[i[:-1]] + st[i[:-1]]), name="cb_softmax")


def _legalize_log_softmax(bb, call):
    x = call.args[0]
    if _ragged_rows(x, int(call.attrs.axis)):
        return bb.call_te(lambda v: _row_softmax_te(v, log=True), x, primfunc_name_hint="log_softmax")
    from tvm import topi

    return bb.call_te(topi.nn.log_softmax, x, int(call.attrs.axis), primfunc_name_hint="log_softmax")


def _args(value):
    """The variables and constants a binding's value reads, in order."""
    from tvm import relax

    if isinstance(value, relax.Call):
        return [x for a in value.args for x in (a.fields if isinstance(a, relax.Tuple) else [a])]
    if isinstance(value, relax.Tuple):
        return list(value.fields)
    return [value.tuple_value] if isinstance(value, relax.TupleGetItem) else [value]


def keep_names(before, after):
    """`after` (FuseOps' result on `before`) with the variable of each fused
    group's call named as the value it stands for in `before`, so a layer's
    output keeps the name of the model's tensor it holds (extract_layers).
    FuseOps names that variable afresh; the value's name is still on its
    uses: an argument of a binding kept from `before`, or a fused function's
    parameter."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    old = {b.var: b.value for block in before["main"].body.blocks for b in block.bindings}
    names = {}
    for block in after["main"].body.blocks:
        for b in block.bindings:
            callee = after[b.value.op] if isinstance(getattr(b.value, "op", None), relax.GlobalVar) else None
            was = _args(old[b.var]) if b.var in old else list(callee.params) if isinstance(callee, relax.Function) else []
            names.update((v, w.name) for v, w in zip(_args(b.value), was)
                         if isinstance(v, relax.DataflowVar) and isinstance(w, relax.Var) and v.name != w.name)

    @mutator
    class Names(PyExprMutator):
        def visit_var_binding_(self, binding):
            if binding.var not in names:
                return super().visit_var_binding_(binding)
            value = self.visit_expr(binding.value)
            self.set_var_remap(binding.var, self.builder_.emit(value, name_hint=names[binding.var]))

    out = tvm.IRModule(dict(after.functions.items()), attrs=after.attrs)
    out["main"] = Names(after).visit_expr(after["main"])
    return out


def _split_concats(mod, most):
    """Concatenations of more than `most` tensors as a tree of ones of at
    most `most` (an unrolled recurrence stacks one tensor per step)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class Split(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            parts = call.args[0].fields if call.op.same_as(CONCAT) and isinstance(call.args[0], relax.Tuple) else ()
            if len(parts) <= most:
                return call
            axis = int(call.attrs.axis)
            while len(parts) > most:
                parts = [self.builder_.emit(relax.op.concat(parts[k:k + most], axis)) if len(parts) - k > 1
                         else parts[k] for k in range(0, len(parts), most)]
            return relax.op.concat(parts, axis)

    CONCAT = tvm.ir.Op.get("relax.concat")
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    out["main"] = Split(mod).visit_expr(mod["main"])
    return out


def _unfuse_wide(mod, most):
    """Fused groups that would bind more than `most` tensors (parameters
    and outputs) back to one layer per operator."""
    import tvm
    from tvm import relax

    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    fused = [gv for gv, f in mod.functions.items() if isinstance(f, relax.Function) and "Primitive" in (f.attrs or {})]
    for gv in fused:
        f = mod[gv]
        outputs = len(f.ret_ty.fields) if isinstance(f.ret_ty, relax.TupleType) else 1
        wide = len(f.params) + outputs > most
        # InlinePrivateFunctions inlines the private functions: the wide groups, not the others
        out[gv] = f.without_attr("Primitive") if wide else f.with_attr("global_symbol", gv.name_hint)
    out = relax.transform.InlinePrivateFunctions()(out)
    for gv in fused:
        if gv in out.functions:
            out[gv] = out[gv].without_attr("global_symbol")
    return out


OPAQUE = 8  # TVM's OpPatternKind kOpaque


def _pattern_at_constants(f):
    """The op pattern TVM gives PrimFunc `f` with each size it reads at run
    time (a scalar parameter, a buffer's dimension) made a constant: a
    resize or reshape whose indices read a size is as injective at every
    size as at one, but TVM's analysis takes a load index reading a
    variable the store's do not as opaque, which kept every such operator
    a layer of its own (a pass over memory each)."""
    import tvm
    from tvm import relax, tirx

    consts = {}

    def const(v):
        return consts.setdefault(v, tirx.IntImm(str(v.ty.dtype), 7 + 2 * len(consts)))

    given = {}
    for p in f.params:
        if not isinstance(p.ty, tirx.buffer.BufferType):
            if str(p.ty.dtype).startswith("int"):
                given[p] = const(p)
        elif all(isinstance(d, (tirx.IntImm, tirx.Var)) for d in p.shape) and not p.strides:
            given[p] = tirx.decl_buffer([const(d) if isinstance(d, tirx.Var) else d for d in p.shape], p.dtype,
                                        p.name, elem_offset=p.elem_offset)
    if not consts:
        return OPAQUE
    try:
        one = relax.transform.AnnotateTIROpPattern()(tvm.IRModule({"f": f.specialize(given).without_attr("op_pattern")}))
    except Exception:  # noqa: BLE001 - a size that is no parameter's: left opaque, as TVM has it
        return OPAQUE
    return int(one["f"].attrs["op_pattern"])


def _apart_where_forms_differ(mod, _ctx=None):
    """`mod` with each PrimFunc whose buffer for an argument is written in
    another form than the argument's extents kept apart (opaque): TVM
    legalizes some operators to simplified extents (its concatenation: x +
    3 where Relax said 3 + x, which block_layout's cb_block took), and
    FuseTIR refuses buffers equal but written differently."""
    import tvm
    from tvm import relax
    from tvm_ffi import structural_equal

    call_tir, out = tvm.ir.Op.get("relax.call_tir"), tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    calls = [b.value for f in mod.functions.values() if isinstance(f, relax.Function) for block in f.body.blocks
             for b in block.bindings if isinstance(b.value, relax.Call) and b.value.op.same_as(call_tir)]
    for call in calls:
        for x, p in zip(call.args[1].fields, mod[call.args[0]].params):
            shape = getattr(getattr(x, "ty", None), "shape", None)  # (the kernel's variables are its own: mapped)
            if isinstance(shape, relax.ShapeExpr) and hasattr(p, "shape") and not structural_equal(
                    list(shape.values), list(p.shape), map_free_vars=True):
                out[call.args[0]] = mod[call.args[0]].with_attr("op_pattern", OPAQUE)
    return out


def _patterns_at_run_time_sizes(mod, _ctx=None):
    """`mod` with each opaque PrimFunc that reads sizes set at run time
    given the pattern it has at constant sizes (_pattern_at_constants).
    Reshapes stay apart: fused, their indices over sizes set at run time
    (divisions by a symbolic row length) do not simplify as constant ones
    do, and a fused transpose-and-reshape ran 10x slower than the three
    apart."""
    import tvm
    from tvm import relax, s_tir, tirx

    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    for gv, f in mod.functions.items():
        tensors = [p for p in f.params if isinstance(p.ty, tirx.buffer.BufferType)] if isinstance(f, tirx.PrimFunc) else []
        if len(tensors) == 1 and len(f.params) > 1:  # sizes written as a tensor (TVM's shape_to_tensor): apart,
            out[gv] = f.with_attr("op_pattern", OPAQUE).with_attr(APART, True)  # FuseTIR defines their sizes twice
            continue  # in a group where another kernel's buffer has the same size for an extent
        if (isinstance(f, tirx.PrimFunc) and int((f.attrs or {}).get("op_pattern", -1)) == OPAQUE
                and isinstance(f.body, s_tir.SBlockRealize) and not relax.analysis.has_reshape_pattern(f)
                and APART not in (f.attrs or {})):
            kind = _pattern_at_constants(f)
            if kind != OPAQUE:
                out[gv] = f.with_attr("op_pattern", kind)
    return out


def apply(mod, cpu=True):
    """`cpu`: lower for the CPU code generator (the GPU's GLSL emitter has no
    bit reinterpretation, which the vectorizable sigmoid, exp, softmax, erf
    and tanh use)."""
    import tvm
    from tvm import relax

    from .lower_resize import legalize_resize2d
    from .lower_sequential import legalize_cumsum, legalize_topk

    fast = {"relax.sigmoid": _legalize_sigmoid, "relax.nn.softmax": _polynomial("softmax"),
            "relax.nn.log_softmax": _legalize_log_softmax,
            **{f"relax.{op}": _polynomial(op) for op in ("exp", "erf", "tanh")}}
    legalize = {"relax.image.resize2d": legalize_resize2d, "relax.cumsum": legalize_cumsum,
                "relax.topk": legalize_topk, "relax.strided_slice": _legalize_strided_slice, **(fast if cpu else {})}
    seq = tvm.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        # Nearest resize gets coldbrew's exact lowering (see lower_resize.py),
        # CumSum and TopK sequential kernels (lower_sequential.py);
        # on CPUs, sigmoid, exp, softmax, erf and tanh vectorizable ones.
        relax.transform.LegalizeOps(customize_legalize_map=legalize),
        relax.transform.AnnotateTIROpPattern(),
        tvm.transform.module_pass(_patterns_at_run_time_sizes, 0, "PatternsAtRunTimeSizes"),
        tvm.transform.module_pass(_apart_where_forms_differ, 0, "ApartWhereFormsDiffer"),
        relax.transform.FoldConstant(),
    ])
    if not cpu:  # a GPU kernel binds each tensor to a storage buffer of its own
        mod = _split_concats(mod, GPU_MAX_BINDINGS - 1)
    bound = (lambda m: m) if cpu else (lambda m: _unfuse_wide(m, GPU_MAX_BINDINGS))
    fuse = tvm.transform.module_pass(lambda m, _: bound(keep_names(m, relax.transform.FuseOps()(m))), 0, "FuseOps")
    seq = tvm.transform.Sequential([seq, fuse, relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()])
    try:
        with tvm.transform.PassContext(opt_level=3):
            return seq(mod)
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise CompileError(f"lowering to TIR failed: {msg[-1] if msg else type(e).__name__}") from None


def run(c):
    c.mod = apply(c.mod, cpu=not c.on_gpu)
    return c
