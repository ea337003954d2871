"""Turn a variant + spec into PrimFuncs: the weight transform and the
(scheduled) execute kernel. Used by the compiler passes, the tests and the
kernel benchmark."""
import tvm
from tvm import s_tir, te

from . import ANCHOR


def input_shape(spec):
    if spec.__class__.__name__ == "ConvSpec":
        return (spec.n, spec.c, spec.h, spec.w)
    return (spec.m, spec.k)


def transform_func(variant, spec, params):
    """PrimFunc(raw, transformed), or None for the identity."""
    fn = variant.transform(spec, params)
    if fn is None:
        return None
    w = te.placeholder(spec.weight_shape, spec.dtype, name="raw")
    return te.create_prim_func([w, fn(w)])


def execute_te(variant, spec, params):
    """A TE function (x, wt) -> out, for BlockBuilder.emit_te."""
    return lambda x, wt: variant.compute(spec, x, wt, params)


def execute_func(variant, spec, epilogue=None, params=None):
    """Standalone PrimFunc(x, wt, [extra...], out): the execute kernel with an
    optional epilogue (a function of (out, *extra placeholders))."""
    params = params if params is not None else variant.space(spec)[0]
    x = te.placeholder(input_shape(spec), spec.dtype, name="x")
    wt = te.placeholder(variant.transformed_shape(spec, params), spec.dtype, name="wt")
    out = variant.compute(spec, x, wt, params)
    extra = []
    if epilogue is not None:
        out, extra = epilogue(out)
    return te.create_prim_func([x, wt, *extra, out])


def schedule(func, variant, spec, params=None):
    """Apply the variant's schedule to a PrimFunc holding its anchor block."""
    sch = s_tir.Schedule(func)
    variant.schedule(sch, sch.get_sblock(ANCHOR), spec, params if params is not None else variant.space(spec)[0])
    return sch.mod["main"]


def build(funcs, target):
    """Compile {name: PrimFunc} for `target` (a coldbrew Target)."""
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    with tvm.transform.PassContext(opt_level=3):
        return tvm.tirx.build(mod, target=tvm.target.Target(target.llvm()))
